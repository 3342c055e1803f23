"""modules.sd_models (stand-in): where the webui keeps its loaded model, and its moves of it (recorded in `moves`)."""


class ModelData:
    sd_model = None


model_data = ModelData()


moves = []


def send_model_to_cpu(m):
    moves.append(("cpu", m))


def send_model_to_device(m):
    moves.append(("device", m))
