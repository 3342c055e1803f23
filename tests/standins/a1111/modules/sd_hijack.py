"""modules.sd_hijack (stand-in): the applied cross attention optimization (None until one is applied)."""
current_optimizer = None
