"""The one exception type of the data package."""
from mha.errors import UserError


class DataError(UserError, ValueError):
  """Bad input data or a data config that cannot be served.

  The message names the file, split, line or config field at fault, so that a
  user can fix the input without reading the code.
  """
