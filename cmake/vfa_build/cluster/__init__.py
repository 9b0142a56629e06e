"""The sccache-dist cluster as a build sees it: bounds, the off-switch, private outputs, trust, a compile's environment."""
