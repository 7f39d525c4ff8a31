"""KServe v2 over HTTP/1.1 with Triton's extensions, on uvloop + httptools."""
