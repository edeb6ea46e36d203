//! Pod sources (static pod directory, manifest URL, API server) merged into one stream.
