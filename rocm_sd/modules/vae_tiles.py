"""AutoencoderKL's decode in tiles of a few fixed latent shapes, so that every output resolution runs the same
convolution problems.

A convolution library searches its algorithms once per problem (MIOpen's find, cuDNN's benchmark mode), and every
new image size brings new problems to the VAE decoder: on ROCm that search takes minutes at the first decode of
each size. Here a latent at least as large as the smallest tile on both sides (images of 512 pixels or more a side
for SD's VAEs) is decoded one image at a time (batch 1, whatever the pipeline's batch) in tiles whose sides are taken
from TILE_SIZES, so the decoder only ever sees len(TILE_SIZES)**2 input shapes. Narrower latents decode as they are:
a tile would have to be padded past the image, and padding changes what the decoder's GroupNorms average, where
diffusers' own tiled decode shrinks the tile instead (tests/test_vae_tiles.py measured both on the same input).

Per axis the tiles are all of one side, the one that decodes the fewest latent rows with overlaps of at least
MIN_OVERLAP (ties: the larger side, fewer seams). The first tile starts at 0 and the last ends at the edge, the
overlaps spread evenly between: no tile reaches past the image, so none is padded. diffusers' tiled_decode keeps
fixed overlaps and lets the last row and column of tiles shrink (new shapes at every size), and its blend keeps each
tile up to where the next begins, which needs overlaps of at most half a tile; here the last tile's overlap can be
most of a tile, so the tiles are blended as a weighted sum: each tile's weight ramps linearly from its inner edges
over its overlap with each neighbour (the pixels nearest a cut, where the decoder saw the cut's zero padding, count
least), normalised by the sum of weights.

Each tile's GroupNorms see that tile's statistics, not the whole image's: tiles differ from the untiled decode as
diffusers' own tiled decode does (tests/test_vae_tiles.py compares the two).

The plan (Tiles) is apart from the decode: parallel/vae_split.py deals Tiles.bands, overlapping bands of rows, to the
ranks that make an image, and blends what they decoded with the same ramps.
"""
from __future__ import annotations

import functools
import itertools
import math
from dataclasses import dataclass

import torch

# Tile sides in latents: 64, 96 and 128 (512, 768 and 1024 pixels for SD's VAEs) are the native sizes of SD1.5,
# SD2.x and SDXL / SD3 / Flux, which therefore decode as one tile (the untiled result, at batch 1); nine tile shapes.
TILE_SIZES = (64, 96, 128)
# diffusers' tile_overlap_factor (0.25) of its 64-latent tile.
MIN_OVERLAP = 16


def axis_tiles(length: int, sizes=TILE_SIZES, min_overlap: int = MIN_OVERLAP) -> tuple[int, list[int]]:
    """(tile side, tile starts) along an axis of `length` latents, at least the smallest side."""
    best = None
    for side in sorted((s for s in sizes if s <= length), reverse=True):
        count = 1 if side == length else math.ceil((length - min_overlap) / max(1, side - min_overlap))
        if best is None or count * side < best[0] * best[1]:
            best = (side, count)
    side, count = best
    return side, _spread(length, side, count)


def axis_bands(length: int, count: int, min_overlap: int = MIN_OVERLAP) -> tuple[int, list[int]]:
    """(band side, band starts): `count` bands of one side along an axis of `length` latents, the smallest side
    whose neighbours overlap by min_overlap or more (parallel/decode.py deals them to ranks)."""
    if count < 1:
        raise ValueError(f"a band count must be >= 1, got {count}")
    side = length if count == 1 else min(length, math.ceil((length - min_overlap) / count) + min_overlap)
    return side, _spread(length, side, count)


def _spread(length: int, side: int, count: int) -> list[int]:
    """Starts of `count` tiles of `side`: the first at 0, the last flush with the edge, the overlaps even between."""
    return [round(k * (length - side) / (count - 1)) if count > 1 else 0 for k in range(count)]


@dataclass(frozen=True)
class Tiles:
    """Where a latent's tiles lie: side_y x side_x latents each, at every (row, col) start, in row-major order."""
    side_y: int
    rows: tuple[int, ...]
    side_x: int
    cols: tuple[int, ...]

    @classmethod
    def plan(cls, height: int, width: int, sizes=TILE_SIZES, min_overlap: int = MIN_OVERLAP) -> Tiles:
        """The fixed-shape tiles of a tiled() latent (the module's docstring)."""
        side_y, rows = axis_tiles(height, sizes, min_overlap)
        side_x, cols = axis_tiles(width, sizes, min_overlap)
        return cls(side_y, tuple(rows), side_x, tuple(cols))

    @classmethod
    def bands(cls, height: int, width: int, count: int, min_overlap: int = MIN_OVERLAP) -> Tiles:
        """`count` overlapping bands of rows, each the whole width."""
        side_y, rows = axis_bands(height, count, min_overlap)
        return cls(side_y, tuple(rows), width, (0,))

    @property
    def height(self) -> int:
        return self.rows[-1] + self.side_y

    @property
    def width(self) -> int:
        return self.cols[-1] + self.side_x

    def crops(self) -> list[tuple[slice, slice]]:
        """Each tile's (rows, columns) of the latent, in row-major order."""
        return [(slice(top, top + self.side_y), slice(left, left + self.side_x))
                for top in self.rows for left in self.cols]

    def blend(self, decoded) -> torch.Tensor:
        """The image [C', H * s, W * s] of the tiles' decodes [C', side_y * s, side_x * s] (an iterable, in crops()
        order, consumed one tile at a time), each weighted by its ramps and normalised by the sum of weights (the
        module's docstring)."""
        out = total = None
        places = itertools.product(range(len(self.rows)), range(len(self.cols)))
        for (rows, cols), tile, (i, j) in zip(self.crops(), decoded, places):
            if out is None:  # the decoder's upscaling, read off the first tile
                scale = tile.shape[-1] // self.side_x
                weights_y = _ramps(self.rows, self.side_y, scale, tile.device)
                weights_x = _ramps(self.cols, self.side_x, scale, tile.device)
                out = torch.zeros(tile.shape[0], self.height * scale, self.width * scale, device=tile.device)
                total = torch.zeros(1, self.height * scale, self.width * scale, device=tile.device)
            weight = weights_y[i][:, None] * weights_x[j][None, :]
            region = (slice(None), slice(rows.start * scale, rows.stop * scale),
                      slice(cols.start * scale, cols.stop * scale))
            out[region] += tile.float() * weight
            total[region] += weight
        return (out / total).to(tile.dtype)


def tiled(height: int, width: int, sizes=TILE_SIZES) -> bool:
    """Whether a latent of height x width is decoded in tiles: at least the smallest tile on both sides."""
    return min(height, width) >= min(sizes)


def tile_shapes(height: int, width: int, sizes=TILE_SIZES, min_overlap: int = MIN_OVERLAP) -> set[tuple[int, int]]:
    """The latent shapes the decoder sees for a latent of height x width: the tiles', or the latent's own."""
    if not tiled(height, width, sizes):
        return {(height, width)}
    return {(axis_tiles(height, sizes, min_overlap)[0], axis_tiles(width, sizes, min_overlap)[0])}


def _ramps(starts: list[int], side: int, scale: int, device) -> list[torch.Tensor]:
    """Per tile, its blending weight along one axis in output pixels: rising over the overlap with the tile before,
    falling over the overlap with the tile after, never zero."""
    position = torch.arange(side * scale, device=device, dtype=torch.float32) + 0.5
    weights = []
    for k, start in enumerate(starts):
        weight = torch.ones(side * scale, device=device)
        if k > 0:
            weight = torch.minimum(weight, position / ((starts[k - 1] + side - start) * scale))
        if k + 1 < len(starts):
            weight = torch.minimum(weight, position.flip(0) / ((start + side - starts[k + 1]) * scale))
        weights.append(weight)
    return weights


def decode_tile(vae, tile: torch.Tensor) -> torch.Tensor:
    # AutoencoderKL._decode's untiled path (its own would tile again where vae.enable_tiling() is on)
    if vae.post_quant_conv is not None:
        tile = vae.post_quant_conv(tile)
    return vae.decoder(tile)


def zero_padded(model: torch.nn.Module) -> bool:
    """Whether every convolution of the model pads with zeros, as tiles assume: a circular padding mode (A1111's
    "Tiling", ComfyUI's seamless-texture nodes, set at any time) wraps the whole image, which a tile cannot."""
    return all(m.padding_mode == "zeros" for m in model.modules() if isinstance(m, torch.nn.Conv2d))


def decode_in_tiles(decode, z: torch.Tensor, sizes=TILE_SIZES, min_overlap: int = MIN_OVERLAP) -> torch.Tensor:
    """decode (a [1, C, h, w] latent tile -> its [1, C', h * s, w * s] image) over z [B, C, H, W], tiled() latents
    only, one image at a time, the tiles blended (the module's docstring): [B, C', H * s, W * s]."""
    tiles = Tiles.plan(*z.shape[-2:], sizes, min_overlap)
    return torch.stack([tiles.blend(decode(latent[:, :, rows, cols].contiguous())[0] for rows, cols in tiles.crops())
                        for latent in z.split(1)])


def tiled_decode(vae, z: torch.Tensor, return_dict: bool = True, *, sizes=TILE_SIZES, min_overlap: int = MIN_OVERLAP):
    """AutoencoderKL._decode(z, return_dict) in fixed-shape tiles (the module's docstring); latents narrower than the
    smallest tile go to AutoencoderKL's own _decode."""
    from diffusers.models.autoencoders.vae import DecoderOutput

    if not tiled(*z.shape[-2:], sizes) or not zero_padded(vae):
        return type(vae)._decode(vae, z, return_dict=return_dict)
    decoded = decode_in_tiles(functools.partial(decode_tile, vae), z, sizes, min_overlap)
    return DecoderOutput(sample=decoded) if return_dict else (decoded,)


class HostTiledDecode:
    """A host app's first-stage model's decode(z, **options) in fixed-shape tiles, set as an attribute of the model
    (ComfyUI's object patch on its AutoencoderKL: every image size then decodes through the same nine tile shapes).
    The class's own decode runs each tile and every call this does not take: latents of other ranks (video VAEs)
    or narrower than the smallest tile, and any while a convolution pads other than with zeros."""

    def __init__(self, model):
        self.model = model

    def __call__(self, z, **options):
        decode = functools.partial(type(self.model).decode, self.model, **options)
        if not isinstance(z, torch.Tensor) or z.dim() != 4 or not tiled(*z.shape[-2:]) or not zero_padded(self.model):
            return decode(z)
        return decode_in_tiles(decode, z)
