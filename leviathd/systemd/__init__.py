"""systemd."""
