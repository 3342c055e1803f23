"""modules.script_callbacks (stand-in): the list-optimizers callback."""
callbacks_list_optimizers = []


def on_list_optimizers(callback, *, name=None):
    callbacks_list_optimizers.append(callback)


def list_optimizers_callback():
    res = []
    for callback in callbacks_list_optimizers:
        callback(res)
    return res
