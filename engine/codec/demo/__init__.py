"""The demo mel codec: k-means codes of log-mel frames, decoded by block-wise Griffin-Lim.

`codec.DemoMelCodec` is the codec (registered as "demo-mel"); `features` the mel front end, `decoder` the
code -> mel network, `griffinlim` the streaming block Griffin-Lim.
"""
