"""Configuration (Config): the models, loading and checking files, editing
them, the tighten-only merge, the watch on /etc/leviath, a user's installed
blueprints."""
