"""Retrieval tasks as data: passkey, needle-in-a-haystack and RULER's synthetic families
(families.py), generated offline and seeded (registry.py) with a run's own tokenizer
(text.py), at any length and needle depth (sample.py; the haystacks: filler.py), and the
training loader of retrieval-shaped windows (loader.py, data=retrieval). Scoring them on a
model, the grids and the reports: flashtrain/tasks."""
