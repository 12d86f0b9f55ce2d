from aisimulate_core import _unavailable

RustForwardPassPerfModel = _unavailable("_native.RustForwardPassPerfModel")
