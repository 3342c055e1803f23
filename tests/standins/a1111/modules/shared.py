"""modules.shared (stand-in): the settings and state the attention forwards read."""
import argparse


class Options:
    upcast_attn = False


opts = Options()
loaded_hypernetworks = []
cmd_opts = argparse.Namespace(rocm_sd=False)
