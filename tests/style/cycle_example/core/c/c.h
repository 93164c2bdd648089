// core/c reads core/a: no cycle.
#include "core/a/a.h"
