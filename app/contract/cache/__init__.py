"""S00's cache as both planes run it: composite keys with entity profiles (``keys``), the
Redis + Qdrant store (``store``, ``mirror``), request embeddings (``embedding``,
``encoders``) and the replay of a cached answer as a stream (``replay``)."""
