"""The per-agent network proxy (Services): HTTP CONNECT and SOCKS5 with the
name resolved on the host, domain and address policy tied to the taint
ledger, one audit record per connection."""
