"""launch (stand-in): what an extension's install.py calls; records the pip commands."""
installed = set()
pip_calls = []


def is_installed(package):
    return package in installed


def run_pip(command, desc=None):
    pip_calls.append(command)
