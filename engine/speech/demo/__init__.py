"""The demo phoneme family: espeak-ng phonemes -> speech codes of the demo mel codec.

`family.DemoPhonemeFamily` is the family (registered as "demo-phoneme"); `layout` the token layout,
`espeak` the text front end, `constraint` the marker-merge constraint, `durations` the duration model.
"""
