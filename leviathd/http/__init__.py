"""The daemon's one HTTP/1.1 layer (issue 44): every place that reads or
sends HTTP (the egress proxy and its injection, the engine socket, the
daemon's own clients) parses with `head` and `body` and sends what `write`
wrote. A message is never passed on as the bytes that came: it is parsed
into a head and a decoded body and written anew, so a byte another parser
could read differently (a bare CR or LF, a NUL, an obs-fold, two framings)
is refused here or never leaves.
"""
