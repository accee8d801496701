-- The protocol guard on connect. A missing row means "not a cairnq database" (read as 0).
select value from cairnq_meta where key = 'protocol_version'
