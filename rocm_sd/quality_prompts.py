"""The prompts of `python -m rocm_sd quality`, readable without torch (its --help counts them)."""

# Varied on purpose: subjects, styles, scenes, text, faces, fine texture. Image i uses PROMPTS[i % len(PROMPTS)].
PROMPTS = (
    "a watercolor painting of a lighthouse at dawn",
    "a photograph of an astronaut riding a horse on mars, highly detailed",
    "a close-up portrait of an old fisherman with a grey beard, dramatic lighting",
    "a bowl of ramen on a wooden table, steam rising, food photography",
    "an isometric pixel art city at night with neon signs",
    "a dense forest with sunbeams through fog, oil painting",
    "a red sports car on a coastal road, motion blur, golden hour",
    "a sign that says 'OPEN' in a cafe window, rain on the glass",
)
