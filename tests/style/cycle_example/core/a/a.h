// core/a reads core/b.
#include "core/b/b.h"
