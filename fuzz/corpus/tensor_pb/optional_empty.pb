
o