"""Audio in and out of the server: output encoders, tempo, resampling, and decoding of uploads."""
