Bwj
locationweights.binj
offset64j
length128p