"""Front ends: thin codecs over the service face (``naiad.service.faces``: each depends on the protocols it uses)."""
