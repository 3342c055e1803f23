"""modules.scripts (stand-in): the Script base class extension scripts derive from."""
AlwaysVisible = object()


class Script:
    def title(self):
        raise NotImplementedError

    def show(self, is_img2img):
        return True
