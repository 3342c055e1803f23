"""comfy.ops: module classes whose weights may be cast per call (low-VRAM mode), as in ComfyUI."""
import torch


def cast_bias_weight(s, input):
    weight = s.weight.to(device=input.device, dtype=input.dtype) if s.weight is not None else None
    bias = s.bias.to(device=input.device, dtype=input.dtype) if s.bias is not None else None
    for f in s.weight_function:
        weight = f(weight)
    for f in s.bias_function:
        bias = f(bias)
    return weight, bias


class CastWeightBiasOp:
    comfy_cast_weights = False
    weight_function = []
    bias_function = []


class disable_weight_init:
    class Linear(torch.nn.Linear, CastWeightBiasOp):
        def forward(self, input):
            if self.comfy_cast_weights or self.weight_function or self.bias_function:
                weight, bias = cast_bias_weight(self, input)
                return torch.nn.functional.linear(input, weight, bias)
            return super().forward(input)

    class Conv2d(torch.nn.Conv2d, CastWeightBiasOp):
        def forward(self, input):
            if self.comfy_cast_weights or self.weight_function or self.bias_function:
                weight, bias = cast_bias_weight(self, input)
                return self._conv_forward(input, weight, bias)
            return super().forward(input)

    class GroupNorm(torch.nn.GroupNorm, CastWeightBiasOp):
        def forward(self, input):
            if self.comfy_cast_weights or self.weight_function or self.bias_function:
                weight, bias = cast_bias_weight(self, input)
                return torch.nn.functional.group_norm(input, self.num_groups, weight, bias, self.eps)
            return super().forward(input)

    class LayerNorm(torch.nn.LayerNorm, CastWeightBiasOp):
        def forward(self, input):
            if self.comfy_cast_weights or self.weight_function or self.bias_function:
                weight, bias = cast_bias_weight(self, input)
                return torch.nn.functional.layer_norm(input, self.normalized_shape, weight, bias, self.eps)
            return super().forward(input)


class manual_cast(disable_weight_init):
    class GroupNorm(disable_weight_init.GroupNorm):
        comfy_cast_weights = True

    class LayerNorm(disable_weight_init.LayerNorm):
        comfy_cast_weights = True
