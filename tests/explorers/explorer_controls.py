"""What the explorer tests share: moving a control."""


def changed(explorer, name, value):
    """Set one control; return (updates before, updates after, png before, png after)."""
    before, png = explorer.updates, explorer.image.value
    explorer.controls[name].value = value
    return before, explorer.updates, png, explorer.image.value
