"""X-codec2, Llasa's codec, through the real `xcodec2` package (optional extra: `make install-xcodec2`)."""

from pcgtts.engine.codec.xcodec2.codec import WindowedStreamingDecoder, XCodec2Codec

__all__ = ["WindowedStreamingDecoder", "XCodec2Codec"]
