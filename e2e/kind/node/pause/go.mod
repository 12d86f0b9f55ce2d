module pdscale.local/pause

go 1.24
