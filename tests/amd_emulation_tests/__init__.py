"""Tests of rocm_sd's kernel families run under the CPU emulation of AMD GPUs (tests/amd_emulation), one module a
family: each builds the family for every architecture of build.ARCHS and compares with the float64 references of
rocm_sd/ops and the GPU tests' tolerances. layer_norm and attention: tests/test_amd_emulation.py."""
