"""Textual's workarounds in one place: what the interface patches, wraps or trims in
Textual and rich (lean imports, key names, strip cycles, render caches, the C heap, a terminal
that goes away, the NO_COLOR filter). Each names the private API it touches."""
