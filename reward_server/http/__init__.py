"""The HTTP edge: the FastAPI app, its routes and schemas, auth, middleware, the one table
from the core's errors to status codes, and other servers' routes (:mod:`.compat`). The only
package that imports FastAPI or Starlette; below it, the scoring core knows no HTTP."""
