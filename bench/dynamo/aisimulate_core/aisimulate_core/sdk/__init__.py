from aisimulate_core import _unavailable


def __getattr__(name):
    # Any public name imported from this module is a callable that raises when used; private
    # and dunder names stay missing so that introspection is not fooled.
    if name.startswith("_"):
        raise AttributeError(name)
    return _unavailable(f"sdk.{name}")
