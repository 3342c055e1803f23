"""modules.script_callbacks (stand-in): the callbacks the extension registers, and the webui's calls of them."""
callbacks_list_optimizers = []
callbacks_ui_settings = []
callbacks_model_loaded = []
callbacks_ui_tabs = []


def on_list_optimizers(callback, *, name=None):
    callbacks_list_optimizers.append(callback)


def on_ui_settings(callback, *, name=None):
    callbacks_ui_settings.append(callback)


def on_model_loaded(callback, *, name=None):
    callbacks_model_loaded.append(callback)


def on_ui_tabs(callback, *, name=None):
    callbacks_ui_tabs.append(callback)


def list_optimizers_callback():
    res = []
    for callback in callbacks_list_optimizers:
        callback(res)
    return res


def ui_settings_callback():
    for callback in callbacks_ui_settings:
        callback()


def model_loaded_callback(sd_model):
    for callback in callbacks_model_loaded:
        callback(sd_model)


def ui_tabs_callback():
    res = []
    for callback in callbacks_ui_tabs:
        res += callback() or []
    return res
