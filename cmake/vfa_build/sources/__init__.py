"""Source trust: the pin's anchor, staged content-addressed copies, bounded git calls, torch's headers and metadata."""
