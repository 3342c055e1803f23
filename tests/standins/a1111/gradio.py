"""gradio (stand-in): the component classes the extension names for its settings (the webui renders them)."""


class Radio:
    pass


class Number:
    pass
