"""SavedModel export of a decoding model plus its index (`static_keras.export`).

Depends on TensorFlow (and `tensorflow-serving-api` for warmup records); the
core package never imports it.
"""

from static_keras.export.check import CheckReport
from static_keras.export.check import SavedModelCheckError
from static_keras.export.check import check_saved_model
from static_keras.export.eligibility import ELIGIBLE_SIGNATURE
from static_keras.export.eligibility import EligibilityRefreshInfo
from static_keras.export.eligibility import read_eligibility
from static_keras.export.eligibility import refresh_eligibility
from static_keras.export.metadata import index_from_layer
from static_keras.export.metadata import read_metadata
from static_keras.export.publish import PublishInfo
from static_keras.export.publish import list_versions
from static_keras.export.publish import publish
from static_keras.export.refresh import replace_index
from static_keras.export.saved_model import ExportInfo
from static_keras.export.saved_model import export_saved_model

__all__ = [
    "CheckReport",
    "ELIGIBLE_SIGNATURE",
    "EligibilityRefreshInfo",
    "ExportInfo",
    "PublishInfo",
    "SavedModelCheckError",
    "check_saved_model",
    "export_saved_model",
    "index_from_layer",
    "list_versions",
    "publish",
    "read_eligibility",
    "read_metadata",
    "refresh_eligibility",
    "replace_index",
]
