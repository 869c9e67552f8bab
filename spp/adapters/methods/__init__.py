"""Adapter methods, one module each; the module name is the ``adapter.name`` value (see ``spp.adapters.registry``)."""
