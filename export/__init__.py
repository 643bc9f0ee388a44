"""SavedModel export of a decoding model plus its index (`static_keras.export`).

Depends on TensorFlow (and `tensorflow-serving-api` for warmup records); the
core package never imports it. The names that need TensorFlow or Keras load
on first use (PEP 562): publishing bookkeeping and an eligibility refresh
and a catalogue delta (`refresh_eligibility`, `read_eligibility`,
`update_catalogue`, `read_served_index`, `read_metadata`, `list_versions`,
`newest_good_version`) run without importing either.
"""

from static_keras.export.catalogue_update import CatalogueUpdateInfo
from static_keras.export.catalogue_update import catalogue_fingerprint
from static_keras.export.catalogue_update import read_served_index
from static_keras.export.catalogue_update import update_catalogue
from static_keras.export.eligibility_refresh import EligibilityRefreshInfo
from static_keras.export.eligibility_refresh import read_eligibility
from static_keras.export.eligibility_refresh import refresh_eligibility
from static_keras.export.metadata import index_from_layer
from static_keras.export.metadata import read_metadata
from static_keras.export.publish import HandedOver
from static_keras.export.publish import PublishInfo
from static_keras.export.publish import newest_good_version
from static_keras.export.publish import publish
from static_keras.lazy_names import lazy_names
from static_keras.serving.saved_model_check import CheckReport
from static_keras.serving.saved_model_check import SavedModelCheckError
from static_keras.serving.saved_model_check import check_saved_model
from static_keras.serving.versions import list_versions

# name -> the module that defines it (TensorFlow or Keras on import)
_LAZY = {
    "ELIGIBLE_SIGNATURE": "static_keras.export.eligibility",
    "replace_index": "static_keras.export.refresh",
    "ExportInfo": "static_keras.export.saved_model",
    "export_saved_model": "static_keras.export.saved_model",
}

__getattr__, __dir__ = lazy_names(__name__, _LAZY)
__all__ = [
    "CatalogueUpdateInfo",
    "CheckReport",
    "catalogue_fingerprint",
    "ELIGIBLE_SIGNATURE",
    "EligibilityRefreshInfo",
    "ExportInfo",
    "HandedOver",
    "PublishInfo",
    "SavedModelCheckError",
    "check_saved_model",
    "export_saved_model",
    "index_from_layer",
    "list_versions",
    "newest_good_version",
    "publish",
    "read_eligibility",
    "read_metadata",
    "read_served_index",
    "refresh_eligibility",
    "replace_index",
    "update_catalogue",
]
