"""Front ends: thin codecs over ``naiad.service.Service``."""
