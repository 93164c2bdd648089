// core/b reads core/a back: a cycle.
#include "core/a/a.h"
