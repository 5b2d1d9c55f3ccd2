"""The TTS service layer: text + voice -> audio, using the engine, a speech family and a codec."""
