"""The built-in adapter methods, one package each (``spp``, ``lora``, ``sparse_lora``, ``masked_full``, ``scale_lora``,
``norms``, ``none``): its ``__init__`` registers the method (:func:`spp.adapters.registry.register`), its YAML is
``conf/adapter/<name>.yaml``. A plug-in folder (``SPP_PLUGINS``) is laid out the same way."""
