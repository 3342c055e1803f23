"""comfy.model_management.load_models_gpu and unload_all_models as at a125cd84, for whole models: loading one
clone of a model detaches the loaded clones of it without unpatching them (unpatch_all=False), and the clone loaded
unpatches only what it must (ModelPatcher.partially_load)."""
current_loaded_models = []


def load_models_gpu(models):
    for model in models:
        for loaded in [m for m in current_loaded_models if model.is_clone(m)]:  # itself among them
            current_loaded_models.remove(loaded)
            loaded.detach(unpatch_all=False)
        model.partially_load(model.load_device)
        current_loaded_models.insert(0, model)


def unload_all_models():
    while current_loaded_models:
        current_loaded_models.pop().detach(unpatch_all=True)
