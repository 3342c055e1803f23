"""The VAE decode of one image split over the ranks that make it together (cfg, seq and cfg-seq modes).

In those modes every rank of an image's group holds the same final latents, and each used to decode all of them:
at 1024x1024 the decode is as long as one or two denoising steps, and every rank pays it. Here the latent is cut
into overlapping bands of rows, each the whole width (modules/vae_tiles.py: Tiles.bands), the bands are dealt to
the ranks, each rank decodes its own, one all-gather hands every rank every band, and every rank blends them into
the image with the tiler's linear ramps over each overlap, as the one-process tiled decode does. A band is decoded
as one tile is: post_quant_conv and the decoder, nothing shared with the other bands.

Not exact: the decoder's GroupNorms average over a band, not the whole image, and its mid-block attention sees the
band only, as with any tiled decode (diffusers' tiled_decode, optimize(vae_tiles=True)). The overlap (MIN_OVERLAP,
16 latents, diffusers' 25% of a 64-latent tile) keeps it within the tiler's tolerance: tests/test_parallel_vae_split.py
compares the split image with the one-process decode of the same bands (equal) and with the whole decode (no
further than diffusers' tiled decode). Exchanging the GroupNorm statistics, as DistriFusion does, would make it
exact; that is not built.

How a batch is dealt: B images in k bands each, piece p (image p // k, band p % k) to rank p % N. k is the band
count (1 to N) that gives the busiest rank the fewest latent rows to decode, ties to fewer bands (fewer seams): one
image over 2 ranks is 2 bands, 2 images over 2 ranks are whole images (the CFG pair's batch split, without seams),
3 images over 2 ranks are 2 bands each (3 pieces per rank), and so on; a rank may get one piece fewer than another.
Where no dealing beats every rank decoding the whole batch (a latent not taller than the overlap), the decode is
left whole on every rank, as before.

`mode` (VAE_SPLITS): 'on' splits every latent that can be split; 'auto' only those of AUTO_MIN_AREA latents or more
per image, where the split pays; 'off' leaves the decode alone.
"""
from __future__ import annotations

import functools
import math
from collections import Counter
from dataclasses import dataclass

import torch
import torch.distributed as dist

from ..modules.vae_tiles import MIN_OVERLAP, Tiles, decode_tile, zero_padded
from .arguments import VAE_SPLITS
from .cfg import all_gather_single
from .rounds import LostContact, waiting

# 'auto' splits latents of 128 x 128 latents or more per image: SDXL, SD3 / SD3.5 and Flux at their native
# 1024x1024 and above. There one H200 decodes in ~22 ms (bench/results/vae-decode-h200.md), about one SDXL step in
# cfg mode (21.6 ms, bench/results/parallel-h200.md), and two bands of 72 rows (56% of the image each) save about
# 10 ms for an all-gather of 3.5 MB. At 512x512 (64 latents: 5 ms) two bands are 40 rows each (62%): ~2 ms to gain, within a step's jitter. Not
# yet measured on GPUs: bench/bench_parallel.py's vae-split rows are the check.
AUTO_MIN_AREA = 128 * 128
_WRAPPED_ATTR = "_rocm_sd_vae_split"


@dataclass(frozen=True)
class Pieces:
    """A batch's decode dealt to `ranks` ranks: `batch` images, each cut into `tiles` (bands of rows, or one tile,
    the whole image); piece p is image p // len(tiles.rows)'s band p % len(tiles.rows), decoded by rank p % ranks."""
    batch: int
    tiles: Tiles
    ranks: int

    @property
    def count(self) -> int:
        return self.batch * len(self.tiles.rows)

    @property
    def slots(self) -> int:
        """Pieces per rank in the all-gather: the busiest rank's; the others send an empty slot."""
        return math.ceil(self.count / self.ranks)

    @property
    def busiest_rows(self) -> int:
        """Latent rows the busiest rank decodes (each piece the whole width)."""
        return self.slots * self.tiles.side_y

    def of(self, rank: int) -> list[int]:
        return list(range(rank, self.count, self.ranks))


def plan(batch: int, height: int, width: int, ranks: int, min_overlap: int = MIN_OVERLAP) -> Pieces | None:
    """The dealing of a [batch, C, height, width] latent over `ranks` ranks whose busiest rank decodes the fewest
    rows; None where none decodes fewer than the whole batch (every rank decoding it all, as without a split)."""
    best = None
    for bands in range(1, ranks + 1):
        pieces = Pieces(batch, Tiles.bands(height, width, bands, min_overlap), ranks)
        if bands > 1 and pieces.tiles.side_y >= height:  # the overlap is the whole latent: no band is smaller
            continue
        if best is None or pieces.busiest_rows < best.busiest_rows:
            best = pieces
    return best if best.busiest_rows < batch * height else None


class VaeSplit:
    """The VAE's decode(z, return_dict, ...) with z's images dealt in bands to the ranks of `group` (the module's
    docstring); calls it does not split go to `inner`, the decode that was there (rocm_sd's graphed one, the CFG
    pair's batch split)."""

    def __init__(self, vae, inner, group, mode: str = "auto", lookout=None, min_area: int = AUTO_MIN_AREA,
                 min_overlap: int = MIN_OVERLAP):
        self.vae, self.inner, self.group, self.mode, self.lookout = vae, inner, group, mode, lookout
        self.min_area, self.min_overlap = min_area, min_overlap
        self.rank, self.ranks = dist.get_rank(group), dist.get_world_size(group)
        self.decode_piece = functools.partial(decode_tile, vae)  # [1, C, h, w] latent -> [1, C', h * s, w * s]
        self.stats: Counter = Counter()

    def __call__(self, *args, **kwargs):
        z = args[0] if args else kwargs.get("z")
        pieces = self._pieces(z)
        if pieces is None:
            return self.inner(*args, **kwargs)
        return_dict = args[1] if len(args) > 1 else kwargs.get("return_dict", True)
        images = self._decode(z, pieces)
        self.stats[f"split: {len(pieces.tiles.rows)} band(s) per image"] += 1
        if not return_dict:  # what the pipelines ask for
            return (images,)
        from diffusers.models.autoencoders.vae import DecoderOutput

        return DecoderOutput(sample=images)

    def _pieces(self, z) -> Pieces | None:
        """How this call is dealt, or None (counted in stats) where it is left whole."""
        if not torch.is_tensor(z) or z.dim() != 4:
            reason = "not a batch of latents"
        elif self.mode == "auto" and z.shape[-2] * z.shape[-1] < self.min_area:
            reason = "below the auto threshold"
        elif not zero_padded(self.vae):  # a circular padding wraps the whole image, which a band cannot
            reason = "circular padding"
        else:
            pieces = plan(z.shape[0], *z.shape[-2:], self.ranks, self.min_overlap)
            if pieces is not None:
                return pieces
            reason = "too small to split"
        self.stats[f"whole ({reason})"] += 1
        return None

    def _decode(self, z: torch.Tensor, pieces: Pieces) -> torch.Tensor:
        tiles, bands = pieces.tiles, len(pieces.tiles.rows)
        crops = tiles.crops()
        mine = [self.decode_piece(z[p // bands:p // bands + 1, :, crops[p % bands][0]].contiguous())[0]
                for p in pieces.of(self.rank)]
        # The decoder's dtype on every rank, including one that decodes no piece: the all-gather's must agree.
        dtype = next(self.vae.decoder.parameters()).dtype
        send = torch.zeros((pieces.slots, *self._piece_shape(tiles)), dtype=dtype, device=z.device)
        for slot, piece in enumerate(mine):
            send[slot] = piece
        every = send.new_empty((self.ranks * pieces.slots, *send.shape[1:]))
        self._gather(every, send)
        rank_major = every.unflatten(0, (self.ranks, pieces.slots))

        def piece(p: int) -> torch.Tensor:
            return rank_major[p % self.ranks, p // self.ranks]

        return torch.stack([tiles.blend(piece(image * bands + band) for band in range(bands))
                            for image in range(pieces.batch)])

    def _piece_shape(self, tiles: Tiles) -> tuple[int, int, int]:
        """A decoded piece's [C', side_y * s, width * s], from the VAE's config (a rank may decode no piece)."""
        config = self.vae.config
        scale = 2 ** (len(config.block_out_channels) - 1)
        return config.out_channels, tiles.side_y * scale, tiles.side_x * scale

    def _gather(self, every: torch.Tensor, send: torch.Tensor) -> None:
        """Kept bare, like the CFG pair's all-gather (cfg.py): a rank that fails never joins, and its lookout ends
        the others."""
        try:
            with waiting(self.lookout):
                all_gather_single(every, send, group=self.group)
        except Exception as exc:  # noqa: BLE001 -- the backends' error types differ (gloo, NCCL, RCCL)
            raise LostContact("the all-gather of the VAE decode's bands with this image's ranks broke") from exc


def enable_vae_split(pipe, group, lookout=None, mode: str = "auto", min_area: int = AUTO_MIN_AREA,
                     min_overlap: int = MIN_OVERLAP):
    """Split `pipe`'s VAE decode (AutoencoderKL) over the ranks of `group`, which make the same images (the module's
    docstring; `lookout`: this rank's, told when the rank waits in the all-gather). Apply after rocm_sd.optimize and
    enable_cfg_parallel / enable_sequence_parallel. mode 'off' changes nothing; 'auto' leaves a VAE of another kind
    alone, 'on' refuses it."""
    if mode not in VAE_SPLITS:
        raise ValueError(f"vae split mode must be one of {VAE_SPLITS}, not {mode!r}")
    vae = getattr(pipe, "vae", None)
    if mode == "off" or isinstance(getattr(vae, "decode", None), VaeSplit):
        return pipe
    if type(vae).__name__ != "AutoencoderKL":
        if mode == "auto":
            return pipe
        raise ValueError(f"the VAE split decodes an AutoencoderKL in bands; this pipeline's VAE is "
                         f"{type(vae).__name__}: use vae split 'auto' or 'off'")
    previous = vae.__dict__.get("decode")  # an instance attribute already (graphed, CFG-split) or None
    vae.decode = VaeSplit(vae, vae.decode, group, mode, lookout, min_area, min_overlap)
    setattr(pipe, _WRAPPED_ATTR, (vae, previous))
    return pipe


def disable_vae_split(pipe):
    """Undo enable_vae_split (before disable_cfg_parallel and rocm_sd.revert)."""
    vae, previous = getattr(pipe, _WRAPPED_ATTR, (None, None))
    if vae is None:
        return pipe
    if previous is None:
        del vae.decode
    else:
        vae.decode = previous
    delattr(pipe, _WRAPPED_ATTR)
    return pipe
