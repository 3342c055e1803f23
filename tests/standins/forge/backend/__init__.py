"""Stand-in of Forge's `backend` package (lllyasviel/stable-diffusion-webui-forge as at dfdcbab6, 2025-06-26): the
pieces the A1111 extension's Forge path meets on Forge's Flux. See ../../README.md."""
