"""The one exception type of the data package."""


class DataError(ValueError):
  """Bad input data or a data config that cannot be served.

  The message names the file, split, line or config field at fault, so that a
  user can fix the input without reading the code.
  """
