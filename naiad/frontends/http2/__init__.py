"""A sans-IO HTTP/2 server core (RFC 9113): bytes in, events and bytes out. No sockets, no asyncio, no grpc.

``H2Connection.receive(data)`` parses what the peer sent and returns events (``naiad.frontends.http2.events``);
``send_headers`` / ``send_data`` / ``respond`` queue frames under the peer's flow control; ``data_to_send()`` hands
back the bytes to write. Protocol violations become RST_STREAM or GOAWAY with RFC 9113's codes, never exceptions,
and the limits in ``naiad.frontends.http2.limits`` bound what one peer can make the server hold or do.
"""
