"""The local control API: how the desktop app (or a script) drives a running engine.

A websocket on 127.0.0.1 with a random token kept in the data dir (mode 0600): no token, no access.
`status` is what a node says of itself (`NodeStatus`), `protocol` is sans-I/O (parse, validate,
encode; the status's wire form too), `server` and `client` are thin asyncio glue (the client hands
back a parsed `NodeStatus`),
`token` manages the token and the `control.json` discovery file, `launcher` finds or starts an engine.
"""
