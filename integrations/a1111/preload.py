"""AUTOMATIC1111 preload: the --rocm-sd flag, which selects rocm_sd's attention under "Automatic"."""


def preload(parser):
    parser.add_argument("--rocm-sd", action="store_true", default=False,
                        help="use rocm_sd's attention (cross-attention optimization 'rocm_sd') when set to Automatic")
