"""The model section's optional names, with the defaults used where it sets none."""


# The model section above provides what blocks/model.py lists, and may set these:
MODEL_REVISION = globals().get("MODEL_REVISION")  # a commit sha or tag pins the weights
RESIZE_FILTER = globals().get("RESIZE_FILTER", "bicubic")  # the model's own resampling filter
LOOP_TEMPERATURE = globals().get("LOOP_TEMPERATURE", 0.3)  # a looping page's second try
IMAGE_TAG_MOVING = globals().get("IMAGE_TAG_MOVING", False)  # True: JOB_IMAGE is no fixed build
PDF_DPI = globals().get("PDF_DPI", 400)  # a PDF page's render DPI, unless the model's bound is less
REPETITION_DETECTION = globals().get("REPETITION_DETECTION", (32, 64))  # --repetition-detection
REPETITION_DETECTION_ON = globals().get("REPETITION_DETECTION_ON", False)  # its default
REPETITION_DETECTION_NOTE = globals().get("REPETITION_DETECTION_NOTE", "")  # the card's, when on
MODEL_CARD_NOTE = globals().get("MODEL_CARD_NOTE", "")  # Markdown the card must say of the model
POSTPROCESS_GETS_SIZE = globals().get("POSTPROCESS_GETS_SIZE", False)  # postprocess(.., sent size)
IMAGE_HAS_UV = globals().get("IMAGE_HAS_UV", True)  # False: Jobs run it with `hf jobs run`
JOB_PAGES_PER_S = globals().get("JOB_PAGES_PER_S")  # pages/s measured on the header's flavor
