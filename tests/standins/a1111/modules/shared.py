"""modules.shared (stand-in): the settings and state the extension reads, and the settings registry it adds to."""
import argparse


class OptionInfo:
    def __init__(self, default=None, label="", component=None, component_args=None, onchange=None, section=None):
        self.default, self.label, self.onchange, self.section = default, label, onchange, section

    def info(self, text):
        return self


class Options:
    upcast_attn = False

    def __init__(self):
        self.data_labels = {}

    def add_option(self, key, info):
        self.data_labels[key] = info
        setattr(self, key, info.default)

    def set(self, key, value):
        """As the settings page sets a value: its onchange runs."""
        setattr(self, key, value)
        onchange = self.data_labels[key].onchange
        if onchange is not None:
            onchange()


class State:
    """shared.state: begin / end as the webui's jobs call them (recorded in `jobs`); interrupted is reset by begin."""
    interrupted = False

    def __init__(self):
        self.jobs = []

    def begin(self, job="(unknown)"):
        self.interrupted = False
        self.jobs.append(("begin", job))

    def end(self):
        self.jobs.append(("end",))


opts = Options()
state = State()
loaded_hypernetworks = []
cmd_opts = argparse.Namespace(rocm_sd=False)
