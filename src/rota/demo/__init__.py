"""The example application's external pieces: a YouTube Data API v3 client and its local
stand-in server, brand briefs built from web pages, and a pluggable language model."""
