{{/* An image reference from (list <images.registry> <images.NAME>). */}}
{{- define "kvscale.image" -}}
{{- $image := index . 1 -}}
{{- $registry := $image.registry | default (index . 0) -}}
{{- if $registry }}{{ $registry }}/{{ end }}{{ $image.repository }}:{{ $image.tag }}
{{- end }}
