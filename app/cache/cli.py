"""drill cache-poisoning (filled in by the cache area)."""
