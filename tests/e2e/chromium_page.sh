#!/bin/sh
# Renders the page at URL in headless Chromium (Debian's `chromium`): writes a screenshot to PNG and prints the DOM
# after the page's scripts ran. Usage: chromium_page.sh URL PNG
set -e
url=$1
png=$2
profile=$(mktemp -d)
trap 'rm -rf "$profile"' EXIT
run() { chromium --headless --no-sandbox --disable-gpu --hide-scrollbars --user-data-dir="$profile" "$@" 2>/dev/null; }
run --window-size=1400,1800 --screenshot="$png" "$url" >/dev/null
run --dump-dom "$url"
