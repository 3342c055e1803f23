"""modules.sd_models (stand-in): where the webui keeps its loaded model."""


class ModelData:
    sd_model = None


model_data = ModelData()

